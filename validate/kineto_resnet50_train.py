"""The Kineto ResNet-50 sample's training loop, for ``allocsim capture`` (see ``validate/kineto_resnet50.py``).

pytorch/kineto ``tb_plugin/examples/resnet50_profiler_api.py``: torchvision ResNet-50, ``model.cuda()``,
``cudnn.benchmark``, cross-entropy, SGD(lr 1e-3, momentum 0.9), batch 32 of 224x224 images,
zero_grad after the forward pass. Random images stand in for CIFAR-10 (only their sizes matter).
"""
import torch, torchvision
model = torchvision.models.resnet50(weights=None)
model.cuda()
torch.backends.cudnn.benchmark = True
criterion = torch.nn.CrossEntropyLoss().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
device = torch.device("cuda:0")
model.train()
for step in range(4):
    inputs, labels = torch.rand(32, 3, 224, 224).to(device=device), torch.randint(0, 10, (32,)).to(device=device)
    outputs = model(inputs)
    loss = criterion(outputs, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
